-- refused: DISTINCT
-- at: DISTINCT
SELECT DISTINCT country FROM orders
