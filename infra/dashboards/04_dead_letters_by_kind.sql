-- title: Rejected records by reason
-- chart: bar
-- x: error_kind
-- y: rejected
SELECT
  error_kind,
  count(*) AS rejected
FROM dead_letters
GROUP BY 1
ORDER BY 2 DESC, 1
