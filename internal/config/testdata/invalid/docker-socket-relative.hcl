docker {
  socket = "csisupd.sock"
}