from kjit._cli import main

main()
