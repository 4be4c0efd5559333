docker {
  lease = "1s"
}