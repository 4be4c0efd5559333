
client {
  probe_intervall = "5s"
}