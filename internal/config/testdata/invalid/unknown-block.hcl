nomad {
}