-- refused: CopyTo is not a query
COPY orders TO 'orders.csv'
