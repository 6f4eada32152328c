-- The audit of `streamtable audit`, for analysts in Athena: per Kafka partition of a topic (here
-- orders; replace both names for another topic's table), the offsets found in its table and in
-- dead_letters (a derived table's own rejections — kinds transform, late, future — excluded: the
-- topic's table kept those records), how many offsets between the first and the last are found
-- in neither, and how many are found more than once. Both counts are 0 when every offset landed
-- exactly once; `streamtable audit` also checks the offsets up to each partition's checkpoint
-- and names the offsets.
WITH landed AS (
  SELECT kafka_partition AS p, kafka_offset AS o, count(*) AS t, 0 AS d
  FROM orders
  GROUP BY 1, 2
  UNION ALL
  SELECT kafka_partition AS p, kafka_offset AS o, 0 AS t, count(*) AS d
  FROM dead_letters
  WHERE topic = 'orders' AND error_kind NOT IN ('transform', 'late', 'future')
  GROUP BY 1, 2
),
offsets AS (
  SELECT p, o, sum(t) AS t, sum(d) AS d
  FROM landed
  GROUP BY 1, 2
)
SELECT
  p AS kafka_partition,
  min(o) AS first_offset,
  max(o) AS last_offset,
  sum(t) AS table_rows,
  sum(d) AS dead_letters,
  max(o) - min(o) + 1 - count(*) AS missing,
  sum(CASE WHEN t + d > 1 THEN 1 ELSE 0 END) AS found_twice
FROM offsets
GROUP BY 1
ORDER BY 1
