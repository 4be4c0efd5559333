server {
  bootstrap_expect = -1
}