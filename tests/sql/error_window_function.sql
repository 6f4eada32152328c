-- refused: window function
-- at: ` OVER`
SELECT order_id, row_number() OVER (ORDER BY created_at) AS n FROM orders
