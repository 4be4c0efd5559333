plugin "a" {
}
plugin "a" {
}