-- A list of 9.2 × 10^18 elements per row.
-- refused: range(…) with these constant arguments makes values of about
SELECT order_id, cardinality(range(0, 9223372036854775807)) AS n FROM orders
