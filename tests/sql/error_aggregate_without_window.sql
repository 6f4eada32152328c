-- refused: aggregate without a window
-- at: count(
SELECT country, count(*) AS n FROM orders GROUP BY country
