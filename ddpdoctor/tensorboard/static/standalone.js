// Starts the ddpdoctor dashboard on its own page (dashboard.html?run=NAME); TensorBoard's iframe calls render() itself.
import { render } from "./index.js";

render();
