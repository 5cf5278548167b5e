from shoal_operator.cli import main

main()
