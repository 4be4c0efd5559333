server {
  claim_gc_grace = "0s"
}