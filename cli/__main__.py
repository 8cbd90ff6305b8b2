from palaestra.cli.entry import main

main()
