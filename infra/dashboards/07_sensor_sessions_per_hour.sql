-- title: Sensor sessions per hour (readings less than 5 minutes apart)
-- chart: line
-- x: ts_hour
-- y: sessions, readings
-- From the session windows of sensor_sessions: each session is written once, final, when the
-- watermark passes its end; its partial rows are grouped by session first, as the view
-- sensor_sessions does, so the counts hold however many Kafka partitions a sensor used.
-- The last 7 days only: Athena reads only those days' partitions.
SELECT
  date_trunc('hour', session_start) AS ts_hour,
  count(*) AS sessions,
  sum(readings) AS readings
FROM (
  SELECT session_start, sensor_id, sum(readings) AS readings
  FROM sensor_sessions_partials
  WHERE session_start >= current_timestamp - INTERVAL '7' DAY
  GROUP BY 1, 2
) s
GROUP BY 1
ORDER BY 1
