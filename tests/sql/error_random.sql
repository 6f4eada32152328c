-- refused: random() cannot run on a stream
-- at: random()
SELECT order_id, random() AS r FROM orders
