name = "a"

= 3