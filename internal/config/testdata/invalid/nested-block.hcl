client {
  extra {
  }
}