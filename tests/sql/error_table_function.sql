-- A table function is no source of rows on a stream (it was once taken for a reference table).
-- refused: table function 'generate_series' not found
SELECT o.order_id FROM orders o JOIN generate_series(1, 3) g ON o.order_id = g.value
