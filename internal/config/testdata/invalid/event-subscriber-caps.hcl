client {
  max_event_subscribers = 10
  max_event_subscribers_per_connection = 20
}