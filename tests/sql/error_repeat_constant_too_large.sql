-- Every row would be 100,000,000 copies of the order id: refused before a batch meets it.
-- refused: repeat(…) with these constant arguments makes values of about 100.0 MB each, more than the 1048576 a value may have (max_record_bytes)
SELECT order_id, repeat(order_id, 100000000) AS padded FROM orders
