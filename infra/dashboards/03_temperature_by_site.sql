-- title: Sensor temperature by site over time (per-minute average, °C)
-- chart: line
-- x: ts_minute
-- y: avg_temperature
-- series: site
-- The last 7 days only: Athena reads only those days' partitions.
SELECT
  date_trunc('minute', reported_at) AS ts_minute,
  site,
  round(avg(temperature), 2) AS avg_temperature
FROM readings
WHERE reported_at >= current_timestamp - INTERVAL '7' DAY
GROUP BY 1, 2
ORDER BY 1, 2
