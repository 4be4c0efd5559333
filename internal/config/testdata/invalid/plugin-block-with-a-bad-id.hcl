plugin "../x" {
}