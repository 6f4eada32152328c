-- refused: ORDER BY
-- at: ORDER BY
SELECT order_id FROM orders ORDER BY created_at
