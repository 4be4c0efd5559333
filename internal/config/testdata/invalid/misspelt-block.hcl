clinet {
}