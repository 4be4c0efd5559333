name = "a"
name = "b"