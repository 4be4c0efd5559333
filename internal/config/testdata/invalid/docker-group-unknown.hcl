docker {
  group = "no-such-group-here"
}