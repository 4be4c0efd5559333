client "x" {
}