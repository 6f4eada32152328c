-- refused: not a query
INSERT INTO orders SELECT * FROM orders
