plugin {
}