-- title: Rejected records by reason
-- chart: bar
-- x: error_kind
-- y: rejected
-- The last 7 days only: Athena reads only those days' partitions.
SELECT
  error_kind,
  count(*) AS rejected
FROM dead_letters
WHERE failed_at >= current_timestamp - INTERVAL '7' DAY
GROUP BY 1
ORDER BY 2 DESC, 1
