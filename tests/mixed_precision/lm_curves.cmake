# placeholder: the LM loss-curve tests (filled in next)
