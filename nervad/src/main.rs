fn main() {
    eprintln!("nervad: under construction");
    std::process::exit(2);
}
