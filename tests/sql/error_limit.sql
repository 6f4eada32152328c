-- refused: LIMIT
-- at: LIMIT
SELECT order_id FROM orders LIMIT 10
