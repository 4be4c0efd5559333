docker {
  engine_socket = "docker.sock"
}