-- refused: CAST it to
SELECT order_id, NULL AS nothing FROM orders
