-- A recursive CTE the query does not read plans as the query alone.
-- columns: order_id string
WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3)
SELECT order_id FROM orders
