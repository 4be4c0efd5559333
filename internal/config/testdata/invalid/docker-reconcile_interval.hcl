docker {
  reconcile_interval = "0s"
}