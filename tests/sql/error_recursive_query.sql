-- refused: RecursiveQuery is not a query
WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3)
SELECT n FROM r
