-- The Kafka columns come on top of every table, so `*` names the topic's own columns only.
-- columns: sensor_id, site, temperature, humidity, reported_at
SELECT * FROM readings
