client {
}
client {
}