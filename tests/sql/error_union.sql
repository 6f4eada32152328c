-- refused: UNION
-- at: UNION
SELECT order_id FROM orders UNION ALL SELECT order_id FROM payments
