name = "n"
