-- An interval join's SQL runs in the scheduled stage: a call that certainly explodes is refused
-- there too.
-- refused: repeat(…) with these constant arguments makes values of about
SELECT o.order_id, length(repeat(o.order_id, 100000000)) AS padded, p.attempted_at
FROM orders o
JOIN payments p
  ON p.order_id = o.order_id
 AND p.attempted_at BETWEEN o.created_at AND o.created_at + INTERVAL '1' HOUR
