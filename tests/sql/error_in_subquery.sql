-- refused: subquery
-- at: SELECT order_id FROM payments
SELECT order_id FROM orders WHERE order_id IN (SELECT order_id FROM payments)
