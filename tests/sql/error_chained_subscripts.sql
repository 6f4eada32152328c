-- Planning takes time cubic in chained subscripts: 200 took 22 s.
-- refused: an expression chains 17 subscripts or field accesses, more than the 16 a derived table may
SELECT order_id, cardinality(make_array(order_id)[1:2][1:2][1:2][1:2][1:2][1:2][1:2][1:2][1:2][1:2][1:2][1:2][1:2][1:2][1:2][1:2][1:2]) AS n FROM orders
