name = "n"




client {
  probe_interval = "5x"
}