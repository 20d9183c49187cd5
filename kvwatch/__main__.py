from kvwatch.cli import main

main()
