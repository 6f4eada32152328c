-- CUBE of n keys is 2^n grouping sets.
-- refused: GROUPING SETS, ROLLUP and CUBE cannot run on a stream
SELECT window_start, window_end, country, currency, COUNT(*) AS orders
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTE))
GROUP BY CUBE (window_start, window_end, country, currency)
