name = "a"
client {
