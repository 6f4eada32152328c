-- title: Payment success rate by method
-- chart: bar
-- x: method
-- y: success_rate_pct
-- The last 7 days only: Athena reads only those days' partitions.
SELECT
  method,
  count(*) AS attempts,
  round(100.0 * sum(CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END) / count(*), 2) AS success_rate_pct
FROM payments
WHERE attempted_at >= current_timestamp - INTERVAL '7' DAY
GROUP BY 1
ORDER BY 1
