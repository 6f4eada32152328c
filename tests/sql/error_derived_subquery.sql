-- refused: subquery
SELECT order_id FROM (SELECT order_id FROM orders) t
