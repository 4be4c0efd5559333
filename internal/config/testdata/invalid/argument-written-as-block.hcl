client {
  servers {
  }
}