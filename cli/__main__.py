from palaestra.cli.main import main

main()
