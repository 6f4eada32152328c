-- refused: a join between two topics' tables (orders, payments)
-- at: JOIN
SELECT o.order_id, p.payment_id FROM orders o JOIN payments p ON o.order_id = p.order_id
