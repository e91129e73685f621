from ddpdoctor.cli import console_main

console_main()
