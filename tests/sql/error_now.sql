-- refused: now() cannot run on a stream
-- at: now()
SELECT order_id, now() AS seen FROM orders
